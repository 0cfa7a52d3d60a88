"""Who may do what: API tokens, roles, masking, idle timeouts and the security middleware."""
