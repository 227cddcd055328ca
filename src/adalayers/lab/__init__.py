"""The lab: comparisons, multi-task recipes, sweeps, seeds, reports and tuning. It imports the product; the product never imports it."""
