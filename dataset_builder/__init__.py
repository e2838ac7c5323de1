"""dataset_builder."""
