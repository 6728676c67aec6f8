"""What watches a training run: step callbacks (metrics, timing, stragglers, loss health, profiler, step
lines) and the diagnostics of hangs and failures."""
