from flows.cli.launch import main

main()
