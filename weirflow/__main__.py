from weirflow.cli import main

main()
