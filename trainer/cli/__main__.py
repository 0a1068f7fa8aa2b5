from trainforge.trainer.cli import main

main()
