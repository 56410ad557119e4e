"""The dataset: its prepared on-disk format (trial code) and where the images come from (prepare stage only).

- ``prepared``   the prepared dataset in memory and on disk (``data/prepared``): what every trial loads
- ``subset``     a class-balanced fraction of the training set (``train.data_fraction``), drawn per trial seed
- ``sources``    the embedded offline digits and the dispatch to CIFAR-10, as ``PreparedData``
- ``cifar10``    the paper's dataset through torchvision's own loader, never downloading
- ``validation`` a class-stratified validation set carved from the training set (``data.validation_fraction``)
"""
