module modelmint/gorender

go 1.19
