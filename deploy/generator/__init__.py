"""Generator of evald's Prometheus rules, Grafana dashboard and Kubernetes manifests.

Run ``python -m deploy.generator`` from the repository root after changing anything here;
``--check`` fails when a committed file differs from what the generator renders.
"""
