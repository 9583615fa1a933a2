"""Built-in policies; importing this package registers them."""
