"""One module per `gpu-admission` subcommand: its arguments and its run()."""
