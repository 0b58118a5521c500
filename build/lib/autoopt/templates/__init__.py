"""Built-in templates."""
