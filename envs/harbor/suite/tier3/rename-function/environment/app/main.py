from shapes.report import report

print(report())
