"""What a run leaves: its records (config.json, metrics.csv, summary.json), saved models, tracker logs, and the reports built from results files."""
