"""`python -m tapfix.proxy.cli`: the same command line as the `tapfix` script."""

from tapfix.proxy.cli.main import main

if __name__ == "__main__":
    main()
