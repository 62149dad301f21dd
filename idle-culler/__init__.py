"""idle-culler"""
