"""HTML, charts and report pages rendered from the records of a run or a dataset; no Flyte, no torch."""
