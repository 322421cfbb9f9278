from flows.cli.main import main

main()
