"""The Kubernetes layer as pure data (no pulumi): the chart table and values builders, Kueue's objects, monitoring
(scrape config, alert rules, the dashboard), storage. Tests validate every object offline; platform/components/
applies them.
"""
