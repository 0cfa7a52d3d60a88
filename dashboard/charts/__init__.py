"""Charts drawn as SVG on the server, and the metric windows they draw."""
