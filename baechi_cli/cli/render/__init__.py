"""Terminal rendering of what the commands return; the only place that prints with rich."""
