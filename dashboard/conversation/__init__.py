"""A conversation drawn: its flow and its SVG."""
