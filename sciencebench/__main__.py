from sciencebench.cli import main

main()
