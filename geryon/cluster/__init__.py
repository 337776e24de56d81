"""A real (or emulated) cluster's QoS as one object: the inventory, bringing it up, proving it, taking it down.

  inventory  the TOML inventory: hosts (address, user, NIC, role) and switches (kind, address, ports, links)
  emulated   where connections leave from: inside the emulated cluster an inventory names, never into one otherwise
  lifecycle  up (host NIC queues + switch profiles, all or nothing) and down (restore every saved state)
  check      probe flows per class with DSCP sniffed at the receiver, queue counters, a contention test
  cli        `geryon cluster up|check|down INVENTORY [--json]`
"""
