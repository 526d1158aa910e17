"""Prefect flows and tasks that call the pipelines steps; no step logic lives here."""
