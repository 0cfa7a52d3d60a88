"""The monitoring tab's data and the measurements alert rules read."""
