package empty
