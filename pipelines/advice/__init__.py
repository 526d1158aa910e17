"""Serving advice: which registered variant runs on which hardware, and the serving plans registered beside it."""
