#!/bin/bash
echo ready
