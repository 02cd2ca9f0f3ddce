"""Pier on a worker host: how it names things, what it leaves on disk, its processes and zygote."""
