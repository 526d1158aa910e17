"""The registry as a static site: its pages collected, rendered and served."""
