"""singleuser"""
