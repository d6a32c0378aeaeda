"""Training: sharding, the jitted step."""
