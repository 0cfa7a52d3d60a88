"""What every background loop stands on: the loop protocol, breakers, leases, wake-ups, heartbeats."""
