module modelmint/goblob

go 1.19
