"""spawners"""
