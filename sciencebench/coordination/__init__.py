"""Coordination state shared by the login node and the workers, beside the broker's queues.

One protocol (`protocol.Coordinator`: results, leases, slots, job control,
display states) with a Redis and an in-memory implementation, the lease
heartbeat of a running trial, the lost-host watchdog, and the Celery app
both sides configure alike.
"""
