"""The `pretrain` command line and `pretrain gc`: the top floor, above the workflows it launches."""
