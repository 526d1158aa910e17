"""The layer everything imports: settings, errors, the tool runner, atomic files, toolchain pins, step receipts, the validation report and its gates."""
