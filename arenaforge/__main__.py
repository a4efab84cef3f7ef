"""`python -m arenaforge`: the same CLI as the `arenaforge` command."""

from arenaforge.flows.cli import main

if __name__ == "__main__":
    main()
