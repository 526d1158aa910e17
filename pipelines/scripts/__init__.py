"""Scripts that run inside a toolchain venv, never imported by modelmint itself."""
