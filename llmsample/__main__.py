from llmsample.cli import main

main()
