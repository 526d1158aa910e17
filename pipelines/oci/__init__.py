"""OCI publishing: registered artifacts as images in a team's registry, their signatures and provenance as referrers."""
