"""Training: the updater (optimizer, learning rate, clipping), learning-rate control, step protocol,
epoch loop and checkpoints, one concern per module."""
