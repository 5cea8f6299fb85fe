"""The algorithms: one module (or one package, with its helpers) per published system or baseline."""
