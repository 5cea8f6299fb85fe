"""GAS (gas.pdf): the strategy, its activation generation, its progress weights, metrics and shared momentum."""
