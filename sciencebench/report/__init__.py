"""`sciencebench report`: jobs' files (`jobs`), their numbers (`numbers`), one offline HTML page (`page`).

It reads job directories only: no broker, no Docker, no Pier, no network.
"""
