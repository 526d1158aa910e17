"""Trust: the trust policy, the provenance of a registration and its signature, made and checked."""
