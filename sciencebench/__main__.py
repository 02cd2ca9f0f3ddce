"""`python -m sciencebench`: the command line."""

from sciencebench.cli import main

main()
