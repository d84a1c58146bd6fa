"""Workloads: model specs and transformer layer graphs."""
