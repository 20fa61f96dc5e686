"""The training loop and what only it uses: state, signals, validation and data metrics."""
