"""Pier on a worker host: what it leaves on disk, its processes and zygote.

How Pier names trials and compose projects is in `sciencebench.dockerhost.naming`.
"""
