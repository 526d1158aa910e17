"""The registry's operations: register, pull, verify and reproduce, where the store and trust meet."""
