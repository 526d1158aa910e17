"""The registry: registration after validation, manifests, DVC, pull, verify, dvc.yaml generation."""
