"""The sample endpoint: queue ``demo`` with Ping, Fail, FailOnce and Slow handlers."""
