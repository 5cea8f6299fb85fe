"""RingSFL (ringsfl.pdf): the strategy, its ring schedule and one round of relays."""
