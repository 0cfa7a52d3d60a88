"""The receive path: the pump, its transaction modes and chunks, recoverability."""
