"""Evaluations, sweeps and replays, with their reports: may import every other room; nothing imports it."""
