"""autoopt"""
