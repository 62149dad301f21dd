# Example overrides for the embedded hub: `gpulease up --config jupyterhub_config.py`.
# gpulease assembles its own configuration (gpulease.hub.config.hub_config); what this
# file sets wins over it. Every option: `gpulease up --help-all` or docs/config.md.
c = get_config()  # noqa: F821 (provided by traitlets when the file is loaded)

# c.GPULeaseHub.profiles_file = "/etc/gpulease/profiles.yaml"
# c.GPULeaseHub.inventory_file = ""          # empty: NVML on this host
# c.LocalAccountsAuthenticator.max_failures = 5
# c.LocalAccountsAuthenticator.trusted_proxies = ["10.0.0.0/24"]   # an Ingress in front
# c.Spawner.start_timeout = 120
